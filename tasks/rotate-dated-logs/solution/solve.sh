#!/bin/bash
# Select by the date in the name (string comparison of ISO dates), only in the top folder.
cd /var/log/myapp
for f in *-20??-??-??.log; do d=${f%.log}; d=${d#*-}; if [[ "$d" < 2024-03-06 ]]; then rm -- "$f"; elif [[ "$d" < 2024-03-19 ]]; then gzip -- "$f"; fi; done
ls -1 /var/log/myapp
