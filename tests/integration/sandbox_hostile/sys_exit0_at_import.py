# expect: error
# Raise SystemExit(0) while being loaded.
import sys

sys.exit(0)
