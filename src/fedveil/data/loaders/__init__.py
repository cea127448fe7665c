"""Real-data loaders; importing this package registers each one in ``DATASETS``.

A new loader module registers itself with ``@DATASETS.register``; append its import here.
"""
from . import (  # noqa: F401
    adult, cifar, compas, digit_domains, digits, huggingface, image_folder, mnist, mnist_digits, school, shakespeare,
    table, vehicle_synthetic,
)
from . import writer_digits  # noqa: F401
