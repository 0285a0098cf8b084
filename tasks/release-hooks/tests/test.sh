#!/bin/bash
# Verifier: checks the outcome with pytest and writes the reward (1 when every check passes, else 0).
mkdir -p /logs/verifier
if python3 -m pytest -q -rA -p no:cacheprovider --rootdir=/tests /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
