import x


def main():
    return x
