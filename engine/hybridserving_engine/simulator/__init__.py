"""The SGLang SIMULATOR: an HTTP process with SGLang 0.5.23's serving surface and no GPU.

It parses SGLang's `launch_server` flags, serves the endpoints the router, the launcher and the
operator use (`/health`, `/server_info`, `/v1/loads`, `/metrics`, `/generate`, OpenAI routes,
`/pd_role_switch`, ...), runs a prefill/decode bootstrap handoff between instances over loopback
HTTP, and takes every duration and capacity from `hybridserving.core.perfmodel`. Tests, benchmarks
and demos run it in place of SGLang; production runs SGLang.
"""
