"""The HybridServing API: typed models and the CRDs generated from them."""
