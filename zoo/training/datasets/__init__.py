"""The data shipped inside the package (README.md here says where each file comes from), found
beside this module so an installed wheel reads the same files as a checkout. pyproject.toml's
package-data lists them; .ci/wheel-check proves a wheel install reads them."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIPPED_TEXT = HERE / "tinyshakespeare.txt"  # lm, mlm, reverse and speakers; the quality check
TOPICS = HERE / "topics.jsonl"  # `zoo dataset topics`
CITIES = HERE / "cities.tsv"  # `zoo dataset cities`
