import os

print(os.sep)
