#!/bin/bash
# sync report job
echo "sync report done"
