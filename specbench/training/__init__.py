"""Lightning training of drafters: Medusa heads, PPD prompt tokens, distilled drafts; their data and artifacts."""
