def main() -> None:
    print("hi")


x: int = "a"
