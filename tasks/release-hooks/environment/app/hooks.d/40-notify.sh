#!/bin/bash
msg="release 2.4.1 ready"
echo "40 notified: $msg" >> /app/state/hooks.log
