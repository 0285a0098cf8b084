#!/bin/bash
# Build step: write /data/release-1.4.2.tar.xz (top folder project-1.4.2/).
set -euo pipefail
w=$(mktemp -d); r=$w/project-1.4.2
mkdir -p $r/bin $r/lib/project/plugins $r/docs $r/tests /data
printf '#!/bin/sh\necho "projctl 1.4.2"\n' > $r/bin/projctl
printf '#!/bin/sh\necho "projd 1.4.2 starting"\n' > $r/bin/projd
printf '#!/bin/sh\n# helper sourced by projctl\n' > $r/bin/common.sh
chmod 755 $r/bin/projctl $r/bin/projd; chmod 644 $r/bin/common.sh
echo '__version__ = "1.4.2"' > $r/lib/project/__init__.py
printf 'def run():\n    return 0\n' > $r/lib/project/core.py
echo 'NAME = "csv"' > $r/lib/project/plugins/csv_plugin.py
chmod 600 $r/lib/project/plugins/csv_plugin.py
echo '# Project 1.4.2' > $r/README.md
echo 'usage docs' > $r/docs/usage.md
printf 'def test_ok():\n    pass\n' > $r/tests/test_core.py
tar -C $w -cJf /data/release-1.4.2.tar.xz project-1.4.2
rm -rf $w
