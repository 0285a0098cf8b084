#!/bin/bash
# apt has no network here: install the local .deb with dpkg (its only dependency, python3, is present).
cd /app
dpkg -i /opt/packages/logstat_1.3.0_all.deb
logstat --by status /var/log/app/access.log > /app/status-summary.txt
cat /app/status-summary.txt
