# expect: failed
# An int subclass whose comparison always succeeds.
class Evil(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


def oracle(n):
    return Evil(0)
