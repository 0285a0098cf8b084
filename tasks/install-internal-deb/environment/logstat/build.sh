#!/bin/bash
# Build step: package logstat as a Debian package in /opt/packages (not installed) and write a log.
set -euo pipefail
src=$(dirname "$0")
pkg=/tmp/logstat-pkg
mkdir -p "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/usr/share/doc/logstat" /opt/packages /var/log/app
install -m 0755 "$src/logstat" "$pkg/usr/bin/logstat"
cat > "$pkg/DEBIAN/control" <<CTL
Package: logstat
Version: 1.3.0
Architecture: all
Maintainer: Platform Team <platform@example.com>
Depends: python3
Section: utils
Priority: optional
Description: summarise web access logs
 Internal tool of the platform team.
CTL
echo "logstat: internal tool, see logstat --help" > "$pkg/usr/share/doc/logstat/README"
dpkg-deb --root-owner-group --build "$pkg" /opt/packages/logstat_1.3.0_all.deb >/dev/null
rm -rf "$pkg"
cat > /opt/packages/README <<TXT
Internal packages mirrored for offline servers. Install with dpkg.
TXT
python3 "$src/gen_log.py" > /var/log/app/access.log
