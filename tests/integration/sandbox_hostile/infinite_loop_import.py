# expect: timeout
# Never finish loading.
while True:
    pass
