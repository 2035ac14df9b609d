import sys
print("filter")
