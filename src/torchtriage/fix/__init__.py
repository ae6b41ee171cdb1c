"""The closed loop: diagnose, try the fixes in cost order, verify each, keep what is proven."""
