#!/bin/bash
echo "10 version checked: 2.4.1" >> /app/state/hooks.log
