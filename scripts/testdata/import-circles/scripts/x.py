def main():
    import y

    y.main()
