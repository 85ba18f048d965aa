"""What the tests share: fakes of the apiserver and the model hub, the SGLang parser harness, polling,
metric scraping and client requests. Importable as `support` (pytest's `pythonpath`); never shipped."""
