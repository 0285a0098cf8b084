"""Queue worker (placeholder): python3 worker.py --queue NAME."""
import argparse

p = argparse.ArgumentParser()
p.add_argument("--queue", required=True)
print(f"worker consuming {p.parse_args().queue}")
