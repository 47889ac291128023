# expect: killed,timeout
# Flood stdout.
import sys

line = "x" * 65536
while True:
    sys.stdout.write(line)
