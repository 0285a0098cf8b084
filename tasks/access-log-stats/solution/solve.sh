#!/bin/bash
# zcat -f reads plain and gzip files alike; sort -k1,1nr -k2,2 orders count desc then IP text asc.
cd /app
zcat -f /var/log/nginx/access.log* | awk '{print $1}' | sort | uniq -c | awk '{print $1, $2}' | sort -k1,1nr -k2,2 | head -5 > /app/top-ips.txt
zcat -f /var/log/nginx/access.log* | awk '$9 ~ /^5/ {split(substr($4, 2), t, /[\/:]/); m = index("JanFebMarAprMayJunJulAugSepOctNovDec", t[2]); printf "%s-%02d-%s %s\n", t[3], (m + 2) / 3, t[1], t[4]}' | sort | uniq -c | awk '{print $2, $3, $1}' > /app/errors-by-hour.txt
cat /app/top-ips.txt
head /app/errors-by-hour.txt
