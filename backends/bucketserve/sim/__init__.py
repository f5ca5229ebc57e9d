"""BucketServe: bucket-based dynamic batching with prefill/decode disaggregation on Triton."""
