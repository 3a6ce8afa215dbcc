"""HTTP routes of the Gateway, one module per resource."""
