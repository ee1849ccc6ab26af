"""Prepared knowledge graphs: a folder of memory-mapped arrays that every process maps.

`sources.py` writes one from TSV or id files (`shoal kge prepare`), `cache.py` from a
TSV config on first use; `writer.py` and `filter_build.py` write the arrays,
`manifest.py` seals and verifies them, `graph.py` opens a folder, `filter_index.py`
looks answers up in it.
"""
