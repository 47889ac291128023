# expect: failed,timeout,killed,error,oom
# Spawn threads without end.
import threading
import time

while True:
    try:
        threading.Thread(target=time.sleep, args=(100,), daemon=True).start()
    except (RuntimeError, MemoryError):
        pass
