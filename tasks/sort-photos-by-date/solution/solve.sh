#!/bin/bash
# Match with a case-insensitive bash regex and quote every path (names contain spaces and parentheses).
cd /data/incoming
shopt -s nocasematch
re='^img_([0-9]{4})([0-9]{2})([0-9]{2})_([0-9]{6})( \(([0-9]+)\))?\.(jpg|jpeg)$'
for f in *; do if [[ -f "$f" && "$f" =~ $re ]]; then m=("${BASH_REMATCH[@]}"); dir="/data/photos/${m[1]}/${m[2]}/${m[3]}"; base="${m[4]}"; [[ -n "${m[6]}" ]] && base="$base-${m[6]}"; mkdir -p "$dir"; mv -n -- "$f" "$dir/$base.jpg"; fi; done
shopt -u nocasematch
find /data/photos -type f | sort
ls -A /data/incoming
