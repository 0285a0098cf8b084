#!/bin/bash
# monthly report job
echo "monthly report done"
