#!/bin/bash
# Print the enabled services of a services JSON file as "name<TAB>port", sorted by name.
# usage: summary.sh services.json
set -euo pipefail
jq -r '.services[] | select(.enabled == true) | "\(.name)\t\(.port)"' "$1" | LC_ALL=C sort
