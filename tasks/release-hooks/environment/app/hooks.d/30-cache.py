#!/usr/local/bin/python3
with open("/app/state/hooks.log", "a") as fh:
    fh.write("30 cache warmed: %d entries\n" % sum(range(5)))
