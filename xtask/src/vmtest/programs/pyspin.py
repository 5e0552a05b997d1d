# The vmtest's Python program: nearly all of its time in hot_path (and the
# generator sum() calls back into), called through stage and run from
# <module>. No imports: the image carries only the interpreter and its
# `encodings` package.


def hot_path(n):
    return sum(i * i for i in range(n))


def stage(n):
    return hot_path(n)


def run():
    while True:
        stage(100000)


run()
