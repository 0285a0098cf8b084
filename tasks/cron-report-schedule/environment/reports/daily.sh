#!/bin/bash
# daily report job
echo "daily report done"
