#!/bin/bash
# Two faults: the recipe line is indented with spaces ("missing separator") and `python` does not exist
# here (only python3).
cd /app
sed -i 's/^PYTHON = python$/PYTHON = python3/' Makefile
sed -i 's/^        \$(PYTHON)/\t$(PYTHON)/' Makefile
make clean
make
cat build/index.html
