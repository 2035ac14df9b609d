# The initial value of the `code` cell. After editing, load it into the cell
# with `jq -Rs . main.py | cellbox cell set code -`: the program reruns in a
# fresh box (see README.md).
import sys

words = sys.stdin.read().split()
print(f"{len(words)} words, args {sys.argv[1:]}")
for w in sorted(set(words), key=str.lower):
    print(f"{words.count(w):3} {w}")
