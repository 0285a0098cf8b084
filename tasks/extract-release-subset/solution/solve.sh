#!/bin/bash
# List first, then extract only the two folders, dropping the top-level directory.
tar -tJf /data/release-1.4.2.tar.xz
mkdir -p /opt/project
tar -xJf /data/release-1.4.2.tar.xz -C /opt/project --strip-components=1 project-1.4.2/bin project-1.4.2/lib
find /opt/project -printf '%m %p\n' | sort -k2
