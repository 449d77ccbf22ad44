from gpuheal.cli import main

main()
