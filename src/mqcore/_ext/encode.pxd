# Encoding record batches (encode.pyx): nothing is cimported from here yet; the module's Python
# names (EncodedBatch, encode_batch) are re-exported by batch.pyx.
