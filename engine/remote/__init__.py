"""The remote backend: the same engine surface (`EngineAPI`) over an OpenAI-compatible server.

For people who run the model across several machines with a distributed engine (llama.cpp's RPC
backend behind llama-server, vLLM with tensor parallelism): velo-chat keeps its sessions, live
panel and keys, and the server does the computing (docs/remote.md). Needs the `remote` extra
(the `openai` SDK), imported only when a remote profile is used.
"""
