import sys
print("clean")
