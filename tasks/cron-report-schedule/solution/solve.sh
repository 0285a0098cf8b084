#!/bin/bash
# cron.d lines: minute hour day-of-month month day-of-week USER command; MAILTO="" turns mail off.
cat > /etc/cron.d/reports <<'CRON'
# Report jobs (see /opt/reports)
MAILTO=""
SHELL=/bin/bash
30 2 * * 1-5 reports /opt/reports/daily.sh
*/15 8-18 * * * reports /opt/reports/sync.sh
0 4 1 * * reports /opt/reports/monthly.sh
CRON
chown root:root /etc/cron.d/reports
chmod 0644 /etc/cron.d/reports
cat /etc/cron.d/reports
