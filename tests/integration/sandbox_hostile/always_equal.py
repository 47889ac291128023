# expect: failed
# Return an object that equals everything (the classic equality hack).
class AlwaysEqual:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False


def oracle(n):
    return AlwaysEqual()
