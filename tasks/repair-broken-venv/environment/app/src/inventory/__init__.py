"""Stock keeping helpers."""


def restock_needed(stock, minimum):
    """Return the sorted SKUs whose quantity is below their minimum (missing SKUs count as 0)."""
    return sorted(sku for sku, low in minimum.items() if stock.get(sku, 0) < low)
