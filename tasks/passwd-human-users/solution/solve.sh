#!/bin/bash
# Numeric sort on the uid field; filter the uid range and the no-login shells.
cd /app
awk -F: '$3 >= 1000 && $3 <= 60000 && $7 !~ /nologin$/ && $7 != "/bin/false" {print $1 ":" $3 ":" $6}' /data/passwd | sort -t: -k2,2n > /app/users.txt
cat /app/users.txt
