"""Shopping cart with discounts."""
from .pricing import price_of

DEFAULT_DISCOUNTS = {"member": 0.05}


class Cart:
    def __init__(self, items=[], discounts=DEFAULT_DISCOUNTS):
        self.items = items
        self.discounts = discounts

    def add(self, sku, qty=1):
        if qty <= 0:
            raise ValueError("qty must be positive")
        self.items.append((sku, qty))
        return self

    def add_discount(self, name, rate):
        self.discounts[name] = rate
        return self

    def total(self):
        gross = sum(price_of(sku) * qty for sku, qty in self.items)
        rate = min(sum(self.discounts.values()), 0.5)
        return round(gross * (1 - rate), 2)
