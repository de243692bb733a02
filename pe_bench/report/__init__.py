"""Reports from stored records: statistics, tables, figures, sections, comparisons."""
