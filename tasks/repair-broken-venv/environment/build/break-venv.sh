#!/bin/bash
# Build step: a venv "copied from a developer laptop": its interpreter links point to a Python that does
# not exist here, and its site-packages hold an editable install pointing to the laptop's checkout.
set -euo pipefail
python3 -m venv --without-pip /app/.venv
cd /app/.venv/bin
rm -f python python3 python3.11
ln -s /usr/local/bin/python3.12 python3.12
ln -s python3.12 python3
ln -s python3.12 python
sed -i 's|^home = .*|home = /usr/local/bin|; s|^version = .*|version = 3.12.4|; s|^executable = .*|executable = /usr/local/bin/python3.12|; s|^command = .*|command = /usr/local/bin/python3.12 -m venv /home/alex/src/inventory/.venv|' /app/.venv/pyvenv.cfg
mv /app/.venv/lib/python3.11 /app/.venv/lib/python3.12
printf '#!/home/alex/src/inventory/.venv/bin/python3.12\nimport sys\nfrom pytest import console_main\nsys.exit(console_main())\n' > pytest
chmod +x pytest
echo "/home/alex/src/inventory/src" > /app/.venv/lib/python3.12/site-packages/__editable__.inventory-0.4.0.pth
