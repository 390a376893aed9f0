"""Hard limits on input (core: configs and split parameters are checked against them)."""

# Hard limits on config input (a config is small: these stop memory and time blow-ups early).
MAX_CONFIG_BYTES = 256_000  # a YAML config file
MAX_STRING = 4096  # characters of any string value
MAX_LIST = 1000  # items of any list value
MAX_SPEC_VALUES = 1000  # values inside a split or method spec, nested ones included
MAX_COUNT = 100_000  # clients, rounds, evaluation period, chunk size
MAX_SAMPLES = 10_000_000  # test_samples, server_val
MAX_BATCH = 65_536
MAX_EPOCHS = 1000
MAX_SEED = 2**31 - 1
MAX_RATE = 1e6  # lr, weight_decay, ...: past this, training overflows (1e308 crashed with a traceback)
MAX_DEPTH = 20  # nesting of a spec value (lists in lists ...)
