from pgqueue.cli import main

main()
