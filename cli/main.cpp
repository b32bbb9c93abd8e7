// SPDX-License-Identifier: Apache-2.0
// placeholder: the CLI is being written
int main() { return 0; }
