"""IPA implementations under test. See `variants.registry` for the list and `variants.base`
for what a variant declares. Variants never import one another except the shared
reference module, nor the harness."""
