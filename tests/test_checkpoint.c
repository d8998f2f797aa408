/* test_checkpoint.c -- placeholder */
int main(void) { return 77; }
