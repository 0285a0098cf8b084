"""Print the inventory CSV given as argument as a table (quantities right-aligned)."""
import csv
import sys

import tinytable


def main(path: str) -> None:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    print(tinytable.render(rows[1:], header=rows[0], align="lrr"))


if __name__ == "__main__":
    main(sys.argv[1])
