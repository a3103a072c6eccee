"""Writing a deployment: build and add, the adapter .pte files, the records, the byte report."""
