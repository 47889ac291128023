# expect: error
# Exit with success before any test runs.
import os

os._exit(0)
