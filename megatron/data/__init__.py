"""Training data: indexed token files, sample indices, blending, sampling, loaders and recipes.

Modules (import the one you need; importing this package loads nothing else):

- `indexed_dataset`: the `.bin`/`.idx` token file format (reader, writer, fingerprint).
- `content_hash`: sha256 of a token file, of sampled blocks or of every byte.
- `sample_index`: pure numpy construction of the doc / sample / shuffle indices.
- `gpt2_dataset`: `GPT2Dataset`, fixed-length samples across documents, indices cached on disk.
- `blendable_dataset`: `BlendableDataset`, a weighted mix of datasets.
- `splits`: train/valid/test split strings and document-count weights.
- `samplers`: `PretrainingSampler`, the resumable data-parallel batch sampler.
- `loaders`: `build_train_valid_test_datasets` and `build_data_loader`.
- `fingerprints`: which token files datasets read; comparing them during a run and across a
  resume (A16, A17).
- `masks`: loss mask, position ids and document attention masks for a batch.
- `preprocess`, `builtin_corpus`, `prepare`: turning text into token files.
"""
