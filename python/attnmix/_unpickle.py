# SPDX-License-Identifier: Apache-2.0
"""What unpickling calls to rebuild the compiled classes that pickle by more than a constructor call (a compiled
function cannot be pickled by reference, so these live in Python)."""


def accumulator_with_statistics(make, value):
    """The accumulator make() returns (its class called as it was made), holding the statistics ``value``."""
    return make().from_value(value)
