#!/bin/bash
# The pattern rule only depends on the page: add the template and the renderer as prerequisites.
cd /app
make
grep -c "2023" build/*.html
sed -i 's|^build/%.html: pages/%.md$|build/%.html: pages/%.md templates/base.html tools/render.py|' Makefile
make
make
grep -l "all rights reserved" build/*.html
